# GPUs for agg.sh and disagg.sh (sourced by common.sh): which python runs SGLang on GPUs, how
# many GPUs each worker takes, and which ones, as CUDA_VISIBLE_DEVICES names them.

have_gpus() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# choose_python: PYTHON for every process. The user's PYTHON wins. SGLang on GPUs needs CUDA
# torch, sgl-kernel and flashinfer: `make install-gpu`'s .venv-gpu, else the system python3
# (NVIDIA's sglang-runtime image has them there). .venv is CPU-only (CPU torch, sglang without
# its GPU dependencies): the CPU engine's and --sglang-cpu's environment.
choose_python() {
    local venv=.venv
    ((ON_GPUS)) && venv=.venv-gpu
    if [[ -n "$USER_PYTHON" ]]; then
        PYTHON="$USER_PYTHON"
    elif [[ -x "$REPO_ROOT/$venv/bin/python" ]]; then
        PYTHON="$REPO_ROOT/$venv/bin/python"
    else
        PYTHON=python3
    fi
}

# check_gpu_python: before starting anything on GPUs, fail loudly unless PYTHON imports sglang
# and its torch sees a CUDA GPU (bounded: importing sglang takes seconds, never minutes).
check_gpu_python() {
    local out code='import sglang, torch; '
    code+='assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA GPU"'
    if out=$(timeout "${GPU_CHECK_TIMEOUT:-180}" "$PYTHON" -c "$code" 2>&1); then return 0; fi
    log "$PYTHON cannot run SGLang on GPUs: $(tail -n 1 <<<"${out:-no output}")"
    log "fix: 'make install-gpu' (creates .venv-gpu, which these scripts then use), or" \
        "PYTHON=/path/to/python with sglang and CUDA torch (python3 in NVIDIA's" \
        "sglang-runtime:1.6.1 image); --cpu runs the CPU engine instead"
    exit 1
}

# split_words ARRAY STRING OPTION: append STRING's words to ARRAY, split as a shell would split
# them (quotes group words; xargs does the quoting rules).
split_words() {
    local -n into="$1"
    local words=()
    mapfile -d '' words < <(xargs -r printf '%s\0' <<<"$2")
    wait "$!" || { log "$3: cannot split \"$2\" into words (unmatched quote?)"; exit 2; }
    into+=("${words[@]}")
}

# gpus_per_worker SGLANG_ARGS...: the GPUs one SGLang worker with these args uses on this node.
# tp*pp GPUs, times dp unless --enable-dp-attention (its DP ranks share the TP GPUs), spread
# over --nnodes. Only flags on the command line count (not a --config file's).
gpus_per_worker() {
    local tp=1 dp=1 pp=1 nnodes=1 dp_attention=0 arg value
    while (($#)); do
        arg="$1" value="${2:-}"; shift
        case "$arg" in
            --enable-dp-attention) dp_attention=1; continue ;;
            --*=*) value="${arg#*=}"; arg="${arg%%=*}" ;;
        esac
        case "$arg" in
            --tp|--tp-size|--tensor-parallel-size) tp="$value" ;;
            --dp|--dp-size|--data-parallel-size) dp="$value" ;;
            --pp-size|--pipeline-parallel-size) pp="$value" ;;
            --nnodes) nnodes="$value" ;;
        esac
    done
    for value in "$tp" "$dp" "$pp" "$nnodes"; do
        if ! [[ "$value" =~ ^[1-9][0-9]*$ ]]; then
            log "tp/dp/pp/nnodes sizes must be >= 1, got $value"; return 2
        fi
    done
    ((dp_attention)) && dp=1
    if (((tp * pp * dp) % nnodes)); then
        log "tp*pp*dp = $((tp * pp * dp)) GPUs do not split over --nnodes $nnodes"; return 2
    fi
    echo $((tp * pp * dp / nnodes))
}

# visible_gpus: VISIBLE_GPUS, the GPUs this launch may use as CUDA names them, and GPU_SOURCE.
# An existing CUDA_VISIBLE_DEVICES (Slurm, shared machines) is kept: the launch's GPU indices
# count within it. Else nvidia-smi's GPUs, 0..n-1. Returns 1 when neither says.
visible_gpus() {
    VISIBLE_GPUS=()
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        IFS=', ' read -ra VISIBLE_GPUS <<<"$CUDA_VISIBLE_DEVICES"
        GPU_SOURCE="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
        return 0
    fi
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    local n i
    n=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || true
    for ((i = 0; i < n; i++)); do VISIBLE_GPUS+=("$i"); done
    GPU_SOURCE="nvidia-smi -L"
}

# check_gpu_count NEEDED WHAT: fail unless NEEDED GPUs exist (WHAT says who needs them). Where
# nothing can count them, --dry-run only says so (its lines may be meant for another machine).
check_gpu_count() {
    if ! visible_gpus; then
        if ((DRY_RUN)); then
            log "GPUs not checked: no CUDA_VISIBLE_DEVICES and no nvidia-smi here"; return 0
        fi
        log "cannot count the GPUs: no nvidia-smi and no CUDA_VISIBLE_DEVICES (set it, e.g. 0,1)"
        exit 1
    fi
    if (($1 > ${#VISIBLE_GPUS[@]})); then
        log "not enough GPUs: needs $1 ($2 GPUs), ${#VISIBLE_GPUS[@]} available ($GPU_SOURCE)"
        exit 1
    fi
}

# cuda_devices INDEX...: the CUDA_VISIBLE_DEVICES value for these launch GPU indices, mapped
# through VISIBLE_GPUS (as is where nothing counted them).
cuda_devices() {
    local i names=()
    for i in "$@"; do names+=("${VISIBLE_GPUS[i]:-$i}"); done
    local IFS=,
    echo "${names[*]}"
}

# gpu_list ARRAY OPTION VALUE: ARRAY = VALUE's GPU indices (OPTION's, e.g. --prefill-gpus 0,1).
gpu_list() {
    local -n into="$1"
    [[ "$3" =~ ^[0-9]+(,[0-9]+)*$ ]] || { log "$2 takes GPU indices like 0,1, got '$3'"; exit 2; }
    IFS=, read -ra into <<<"$3"
}

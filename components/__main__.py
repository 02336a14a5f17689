"""`python -m components --model-path DIR [--disaggregation-mode null|prefill|decode] ...`"""

from components.worker.main import main

if __name__ == "__main__":
    main()

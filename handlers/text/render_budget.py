"""A time budget for rendering a chat template.

Jinja compiles a template to Python code whose frames carry the file name "<template>". While
a render runs, a trace function on the rendering thread (tracing only those frames, so the
rest of the call costs nothing extra) raises once the deadline has passed: a template that
loops for seconds stops within one template line of the budget and the thread is free again.
The previous trace function (a debugger, coverage) is restored afterwards.
"""

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_TEMPLATE_FILE = "<template>"


class RenderTimeout(Exception):
    """The template ran past its budget."""


def within_budget(render: Callable[[], T], budget_s: float) -> T:
    deadline = time.monotonic() + budget_s

    def in_template(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise RenderTimeout(f"rendering took over {budget_s:g} s")
        return in_template

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == _TEMPLATE_FILE:
            return in_template(frame, event, arg)
        return None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)

"""`python -m demo_core plan ...`: will this fine-tune fit? Memory per device without training (memory/planner.py), printed
in presentation/plan_views.py's words.

main.py registers it with `add_plan_parser(commands)` and dispatches "plan" to `run_plan(args)`; bad input raises
DemoInputError, which main.py prints as one `error: ...` line with exit status 2, as for `compare`.
"""

from __future__ import annotations

from demo_core.memory.plan_request import PlanRequest
from demo_core.memory.planner import plan
from demo_core.results import write_json
from demo_core.settings import add_arguments, from_arguments
from presentation.plan_text import format_plan, plan_document


def add_plan_parser(commands) -> None:
    """The `plan` subcommand on main.py's subparsers (their parser class turns argparse errors into DemoInputError)."""
    parser = commands.add_parser("plan", help="memory per device of a fine-tune, without training: does it fit?")
    add_arguments(parser, PlanRequest)  # a flag per declared setting (planner.py, settings.py)
    parser.add_argument("--json", metavar="PATH", help="write the plan here")


def run_plan(args) -> None:
    request = from_arguments(PlanRequest, args)
    if request.device == "cuda" and request.context_gb is None:
        _initialise_cuda()  # so the plan measures this machine's context instead of assuming one
    document = plan_document(plan(request))
    if args.json:
        write_json(document, args.json)
    print(format_plan(document))


def _initialise_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")

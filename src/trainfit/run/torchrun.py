"""torchrun as ``train --nproc`` starts it, without its failure summary.

torchrun's ``main`` is wrapped in ``@record``, which prints a ``ChildFailedError`` dump (the
rank's exit code, a traceback of the launcher itself, a box of ``=`` lines) whenever a rank exits
non-zero — also after a rank said its own one-line error or was interrupted on purpose (exit
130/143 after its checkpoint). An audit counted the error twice and the dump once on each bad
input under ``--nproc 2``. Here torchrun's own ``parse_args`` and ``run`` (torch/distributed/
run.py) run unchanged, and a failed child is an exit code only: trainfit's launcher reports it
(``cli/train.py``)."""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """torchrun's run; 1 when a rank failed, 128 + N when torchrun itself took signal N (its
    SignalException's traceback, or a KeyboardInterrupt's while it was still importing torch:
    a review)."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        try:
            run(parse_args(sys.argv[1:] if argv is None else argv))
        except ChildFailedError as e:
            _leave_failures(e)
            return 1
        except SignalException as e:
            return 128 + int(e.sigval)
    except KeyboardInterrupt:
        return 130
    return 0


def _leave_failures(e: Any) -> None:
    """The failed ranks' exit codes (negative: the signal that killed it), for the launcher to
    name the rank and the signal (it said "torchrun exit code 1": an audit) — in the folder its
    ranks leave their errors in (run/launch.py), written whole then renamed."""
    import json
    import os
    from pathlib import Path

    from trainfit.run.launch import RANK_ERRORS_ENV

    where = os.environ.get(RANK_ERRORS_ENV)
    if not where or not Path(where).is_dir():
        return
    failed = [{"rank": int(rank), "exit_code": int(f.exitcode), "timestamp": int(f.timestamp)}
              for rank, f in e.failures.items()]
    tmp = Path(where) / ".failed.json"
    tmp.write_text(json.dumps(failed))
    tmp.replace(Path(where) / "failed.json")


if __name__ == "__main__":
    sys.exit(main())

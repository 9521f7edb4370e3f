"""The analysis job of `hpctrain study --analyze-as-job` (orchestrate/study_job.py): hpctrain runs
this script on one rank once every run of the study has ended. It does what the waiting command
does then: each point's cost from the scheduler's accounting, the benchmarks' results, the report
(printed here, so `hpctrain logs STUDY/analysis` shows it, and written to STUDY/report/).

    python study_report.py STUDY_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain.errors import HpctrainError


class AnalysisFailed(HpctrainError):
    quiet = True  # the message says it all: the rank records it without a stack


def main(argv: list[str]) -> int:
    from hpctrain.commands.study import analyze_and_report
    from hpctrain.commands.ui import make_console
    from hpctrain.orchestrate.study_job import gather
    from hpctrain.orchestrate.study_run import study_lock

    if len(argv) != 1:
        raise AnalysisFailed("usage: study_report.py STUDY_DIR")
    study_dir = Path(argv[0])
    console = make_console()  # a log file: no colour codes, nothing wrapped or cut
    try:
        with study_lock(study_dir):
            gather(study_dir, lambda line: console.print(line, markup=False, highlight=False))
            return analyze_and_report(study_dir, console)
    except HpctrainError as e:
        raise AnalysisFailed(str(e)) from None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

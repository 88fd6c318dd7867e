"""``trainfit report``: figures and tables from the JSON of plan, tune, train, doctor and monitor logs.

load (validate files) → build_report (pure numbers) → figures / html / markdown (display) → output
(atomic writes).
"""

from trainfit.report.build import build_report
from trainfit.report.load import ReportInputError, load_inputs
from trainfit.report.model import Report
from trainfit.report.output import make_report

__all__ = ["Report", "ReportInputError", "build_report", "load_inputs", "make_report"]

"""Watch training live: GPUs through NVML, the host through psutil, step metrics from the loop.

``Sampler`` samples in a thread and logs ``monitor.jsonl`` / CSV rows (columns: ``COLUMNS``, the contract in
docs/json-formats.md); ``trainfit monitor`` is the standalone view.
"""

from trainfit.monitor.sampler import COLUMNS, MonitorError, Sampler, check_options

__all__ = ["COLUMNS", "MonitorError", "Sampler", "check_options"]

"""``python -m smith_worker MODULE:APP --queue turns|tools`` is ``smith-worker``."""

from smith_worker.cli import worker_main

worker_main()

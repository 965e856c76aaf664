"""``python -m smith_worker MODULE:APP --queue turns|tools`` is ``smith-worker``."""

from smith_worker.cli import worker_main

if __name__ == "__main__":  # multiprocessing's forkserver re-imports this file as __mp_main__
    worker_main()

"""Running the parts on one machine: Redis, the local model server, worker processes.

Used by ``make demo`` (:mod:`smith_worker.demo.run`) and by the integration tests.
"""

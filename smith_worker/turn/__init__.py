"""A turn on its worker: the turn worker's role (queue, job, services), the lifecycle (attempts, cancel, hand-off,
the terminal write), the attempt's fenced state and lease, and the crash-recovery sweeper."""

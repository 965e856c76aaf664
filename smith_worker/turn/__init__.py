"""A turn on its worker: the lifecycle (attempts, cancel, hand-off, the terminal write), the attempt's fenced state
and lease, and the crash-recovery sweeper."""

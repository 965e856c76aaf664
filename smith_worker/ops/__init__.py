"""Process services shared by every worker: redaction, HTTP retry, Redis health, registration, metrics,
the auto-pipeline and small asyncio helpers."""

"""Process services shared by every worker: redaction, HTTP retry, Redis health, registration, metrics,
token usage counts, the auto-pipeline and small asyncio helpers."""

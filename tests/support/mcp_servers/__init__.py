"""MCP servers the tests run as real subprocesses (stdio) or on loopback HTTP, built with the official SDK."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
LAB_SERVER = str(HERE / "lab_server.py")
LOWLEVEL_SERVER = str(HERE / "lowlevel_server.py")
HTTP_SERVER = str(HERE / "http_server.py")
ELICIT_SERVER = str(HERE / "elicit_server.py")

"""Committed data of past on-disk formats, and the script that wrote it."""

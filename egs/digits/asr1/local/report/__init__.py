"""Sections of the digits recipe's RESULTS.md, one module each (make_report.py)."""

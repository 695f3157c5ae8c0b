"""Helper modules of the fused joint + loss tests (imported as ``helpers.<name>``)."""

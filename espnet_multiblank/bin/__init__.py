"""Command-line entry points (ESPnet's, with the plug-in registered)."""

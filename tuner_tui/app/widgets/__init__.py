"""The dashboard's panels, one widget per module."""

"""Modal screens: the export dialog and the help."""

"""Code generators: printers from lowered, verified tensor programs to target source."""

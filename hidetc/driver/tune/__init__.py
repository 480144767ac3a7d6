"""The tuner: measuring schedule candidates and recording the winners."""

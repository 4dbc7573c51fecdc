"""Numbers that both a measure (torch) and the report (torch-free) name, kept here so the report needs no torch."""

#: matched pairs whose clean/corrupt logit-difference gap is below this many logits get no patching fraction
#: (flagged: the model treats both sides alike); :mod:`seedlab.shortcut.interventions` applies it
MIN_GAP = 1.0

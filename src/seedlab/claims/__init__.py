"""The findings ledger (DESIGN.md, "Findings are data"): one entry per finding in docs/claims/<study>.yaml.

``schema`` reads and validates the entries (bad input: one line, exit code 2), ``evidence`` reads the
numbers they quote from committed files, ``render`` writes README's "What we found", docs/results.md's index
and each results page's claims table from them, ``checks`` holds the rules a test keeps (words follow
decisions, numbers follow their files, pages follow the ledger). Core code: it imports no study and no torch.
"""

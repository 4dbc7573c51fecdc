"""The fork design, once: one GPT per seed, a shared prefix to the fork step s, and runs forked
from it that differ in what some batches carry (or in a perturbation of the weights or the gradient), checked bit
for bit. The twins study and the attribution bank are such designs; a new one declares its arms.

- design.py   :class:`ForkDesign`, the config fields every fork design shares
- arms.py     :class:`Arm`: one run of a seed as data (injections ``{(step, row): tokens}``, a perturbation of the weights or the gradient)
- prefix.py   the shared prefix, ``advance_to``, the replica control and hash comparisons
- folders.py  the design's folder and its runs' folders, the folder policy (claim), the environment check, open_design
- start.py    ``begin``: the one start of a fork command (claim, inputs, settle, environment, lock, first files)
- loop.py     ``run_design``: per seed the prefix, each arm, the replica control, the integrity record
"""

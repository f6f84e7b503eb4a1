"""``hdeval benchmark``: the paper's analyses as one sweep over methods, aggregators, seeds and
training fractions. One job per module: :mod:`.spec` (what to sweep), :mod:`.sweep` (the runs),
:mod:`.heldout` (each run's test predictions), :mod:`.statistics` (bootstrap and the other
figures), :mod:`.settings` (figures per setting), :mod:`.tables` and :mod:`.output` (what is
written). Library code: nothing here prints.
"""

"""What a person sees: the read commands' rows, reports, Dashboard.md, stats, and the console
(the one module that imports rich)."""

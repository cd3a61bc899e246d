"""AWM environments as carried apps: the host side (``host``: the carried module, route
counts, refused imports), the adapter that runs a scenario's code in the app workers
(``adapter``), and the unit the adapter ships and is pinned as (``shipping``)."""

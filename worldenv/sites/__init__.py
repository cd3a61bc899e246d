"""The shipped sites: the web pages of the demo world's services (``worldenv.gui.site``).

``SHIPPED_SITES`` maps a service name to its ``Site``. A site reads its service's
database and calls its service's tools; it is not part of a world's app pin (see
``worldenv.gui.site``).
"""

from __future__ import annotations

from worldenv.gui.site import Site
from worldenv.sites import chat, shop

SHIPPED_SITES: dict[str, Site] = {site.service: site for site in (chat.site, shop.site)}

__all__ = ["SHIPPED_SITES"]

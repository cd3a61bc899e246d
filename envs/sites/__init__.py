"""The shipped sites: the web pages of the demo world's services (``envs.site``).

``SHIPPED_SITES`` maps a service name to its ``Site``. A site reads its service's
database and calls its service's tools; it is not part of a world's app pin (see
``envs.site``).
"""

from __future__ import annotations

from envs.site import Site
from envs.sites import chat, shop

SHIPPED_SITES: dict[str, Site] = {site.service: site for site in (chat.site, shop.site)}

__all__ = ["SHIPPED_SITES"]

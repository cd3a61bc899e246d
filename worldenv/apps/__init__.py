"""The shipped apps: hand-written MCP tool sets for the demo world's services.

``SHIPPED`` maps a service name (``chat``, ``shop``, ``calendar``, ``notes``) to its
``App``. Each app's ``source`` is its module's source text followed by the shared helpers'
(``_common.py``, and the store's ``like_escape`` they search with), so ``app.digest`` pins
all the code that serves a world.
"""

from __future__ import annotations

import inspect
from types import ModuleType

from worldenv.apps import _common, calendar, chat, notes, shop
from worldenv.core.app import App
from worldstore.sqlcheck import like_escape


def _ship(module: ModuleType) -> App:
    app = module.app
    if not isinstance(app, App):
        raise TypeError(f"{module.__name__}.app is not an App")
    app.source = (inspect.getsource(module) + inspect.getsource(_common)
                  + inspect.getsource(like_escape))
    return app


SHIPPED: dict[str, App] = {app.service: app for app in map(_ship, (chat, shop, calendar, notes))}


def shipped_app(service: str) -> App:
    """The shipped app for `service`; KeyError naming the known services otherwise."""
    try:
        return SHIPPED[service]
    except KeyError:
        raise KeyError(f"no shipped app for service {service!r}; known services: "
                       f"{', '.join(sorted(SHIPPED))}") from None


__all__ = ["SHIPPED", "shipped_app"]

"""The browser front end: HTML pages (each with a JSON twin) and the security headers."""

from .pages import router
from .security import SecurityHeadersMiddleware

__all__ = ["router", "SecurityHeadersMiddleware"]

"""The browser front end: HTML pages (each with a JSON twin) and the security headers."""

from app.http.web.pages import router
from app.http.web.preview import router as _preview_router
from app.http.web.security import SecurityHeadersMiddleware

# /e/{slug}/preview.png, /b/{id}/preview.png, /r/{id}/preview.png: the link-preview images.
router.include_router(_preview_router)

__all__ = ["router", "SecurityHeadersMiddleware"]

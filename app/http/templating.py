"""The one Jinja2 environment every HTML route renders with."""

from __future__ import annotations

from fastapi.templating import Jinja2Templates

from app.core import urls
from app.core.resources import templates_dir

templates = Jinja2Templates(directory=str(templates_dir()))
# Templates build every link with app/core/urls.py: {{ urls.batch(batch_id) }}.
templates.env.globals["urls"] = urls

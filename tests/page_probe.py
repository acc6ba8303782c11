"""What a browser page did that a test may assert on (shared by the browser and adversarial suites)."""

from __future__ import annotations


class PageProbe:
    """Everything a page did that a test may assert on: dialogs, page errors, CSP violations."""

    def __init__(self, page):
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def csp_violations(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m]

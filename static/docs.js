// Boots Swagger UI on /docs (a file, not an inline script, so the page keeps the strict CSP).
window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.openapi,
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
});

// Starts Swagger UI on /docs from the locally served bundle (no inline script: the CSP forbids it).
window.SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });

"""outbox.js in headless Chromium (Selenium) and under Node."""

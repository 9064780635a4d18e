"""The chat page, its form endpoints and its WebSocket; templates in templates/chat/."""

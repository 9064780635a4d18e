"""The people's interface: the chat page, its form endpoints and its WebSocket.

Thin: conversation data from chatapp.chat, replies from chatapp.generation.replies,
presets from chatapp.prompts.catalog. Templates live in templates/chat/.
"""

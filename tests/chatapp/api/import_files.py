"""Small export files in ChatGPT's and Open WebUI's shapes, for the import tests."""

from __future__ import annotations


def _node(key, role, text, parent, children, content_type="text"):
    message = None
    if role is not None:
        message = {"id": key, "author": {"role": role},
                   "content": {"content_type": content_type, "parts": [text]}}
    return {"id": key, "message": message, "parent": parent, "children": children}


def chatgpt_with_branch(title: str = "Capitals") -> dict:
    """root -> system -> user q1 -> assistant a1 -> user 'LEFT' -> assistant 'LEFT answer'
                                                 \\-> user 'RIGHT' -> tool -> assistant
    ('RIGHT answer'); the current node is the tool's reply on the right branch."""
    mapping = {
        "root": _node("root", None, "", None, ["sys"]),
        "sys": _node("sys", "system", "", "root", ["q1"]),
        "q1": _node("q1", "user", "Capital of France?", "sys", ["a1"]),
        "a1": _node("a1", "assistant", "Paris.", "q1", ["left", "right"]),
        "left": _node("left", "user", "LEFT question", "a1", ["left-a"]),
        "left-a": _node("left-a", "assistant", "LEFT answer", "left", []),
        "right": _node("right", "user", "RIGHT question", "a1", ["tool"]),
        "tool": _node("tool", "tool", "search results", "right", ["right-a"]),
        "right-a": _node("right-a", "assistant", "RIGHT answer", "tool", []),
    }
    return {"title": title, "create_time": 1.0, "mapping": mapping, "current_node": "right-a"}


def open_webui_chat(title: str = "Greetings") -> dict:
    """user 'Hello' -> two assistant replies (regenerated); the current one is the second."""
    messages = {
        "u1": {"id": "u1", "role": "user", "content": "Hello", "parentId": None,
               "childrenIds": ["r1", "r2"]},
        "r1": {"id": "r1", "role": "assistant", "content": "Hi there.", "parentId": "u1",
               "childrenIds": []},
        "r2": {"id": "r2", "role": "assistant", "content": "Hello! How can I help?",
               "parentId": "u1", "childrenIds": []},
    }
    return {"id": "c1", "title": title,
            "chat": {"title": title, "history": {"messages": messages, "currentId": "r2"}}}

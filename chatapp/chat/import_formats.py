"""Other chat services' export files, read into message trees: ChatGPT's
`conversations.json` and Open WebUI's JSON export.

Only what a conversation can hold is kept: user and assistant messages with text.
System, tool and empty nodes are left out, and their children hang from the nearest
message that is kept, so branches (edits, regenerations) survive as siblings. Anything
that cannot be read raises ImportRefused naming the conversation and the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEPT_ROLES = ("user", "assistant")


class ImportRefused(ValueError):
    """The file cannot be read; the message names what and where."""


@dataclass
class ImportedMessage:
    key: str  # the source's id for it
    parent: str | None  # the key of the nearest kept ancestor
    role: str
    content: str


@dataclass
class ImportedConversation:
    title: str
    messages: list[ImportedMessage] = field(default_factory=list)  # parents before children
    current: str | None = None  # the key of the leaf the source had on screen


def read_export(data: object) -> list[ImportedConversation]:
    """The conversations of an export file's parsed JSON (a list of them, or one)."""
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ImportRefused("The file holds no conversations.")
    return [_read_one(item, n) for n, item in enumerate(items, start=1)]


def _read_one(item: object, n: int) -> ImportedConversation:
    if isinstance(item, dict) and isinstance(item.get("mapping"), dict):
        return _chatgpt(item, n)
    if isinstance(item, dict) and isinstance(item.get("chat"), dict):
        return _open_webui(item, n)
    raise ImportRefused(f"Conversation {n} is neither a ChatGPT export (an object with a "
                        f"\"mapping\") nor an Open WebUI export (an object with a \"chat\").")


def _where(n: int, title: str) -> str:
    return f"conversation {n}" + (f" (\"{title[:60]}\")" if title else "")


def _title(value: object) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


# -- ChatGPT -----------------------------------------------------------------------


def _chatgpt_text(message: dict, where: str) -> str | None:
    """The text of a ChatGPT message, None for content that is not text (a browsing
    display, an image alone, the model's hidden reasoning)."""
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, dict):
        raise ImportRefused(f"In {where}, \"content\" is not an object.")
    kind = content.get("content_type", "text")
    if kind == "code" and isinstance(content.get("text"), str):
        return "```\n" + content["text"] + "\n```"
    if kind not in ("text", "multimodal_text"):
        return None
    parts = content.get("parts", [])
    if not isinstance(parts, list):
        raise ImportRefused(f"In {where}, \"content.parts\" is not a list.")
    # Images and files are objects among the parts; only the text is kept.
    return "\n".join(p for p in parts if isinstance(p, str))


def _chatgpt(item: dict, n: int) -> ImportedConversation:
    title = _title(item.get("title"))
    where = _where(n, title)
    mapping = item["mapping"]
    nodes: dict[str, dict] = {}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise ImportRefused(f"In {where}, node {key} is not an object.")
        nodes[str(key)] = node
    kept: dict[str, ImportedMessage | None] = {}
    for key, node in nodes.items():
        message = node.get("message")
        if message is None:
            kept[key] = None
            continue
        at = f"{where}, message {key}"
        if not isinstance(message, dict):
            raise ImportRefused(f"In {at}, \"message\" is not an object.")
        author = message.get("author")
        role = author.get("role") if isinstance(author, dict) else None
        if not isinstance(role, str):
            raise ImportRefused(f"In {at}, the author's role is missing.")
        text = _chatgpt_text(message, at)
        hidden = (message.get("metadata") or {}).get("is_visually_hidden_from_conversation")
        kept[key] = (ImportedMessage(key, None, role, text)
                     if role in KEPT_ROLES and text and text.strip() and not hidden else None)
    parents = {key: _parent_key(node.get("parent"), nodes) for key, node in nodes.items()}
    children = {key: _child_keys(node.get("children"), nodes, where, key)
                for key, node in nodes.items()}
    return _tree(title, kept, parents, children, item.get("current_node"), where)


def _parent_key(value: object, nodes: dict) -> str | None:
    return str(value) if value is not None and str(value) in nodes else None


def _child_keys(value: object, nodes: dict, where: str, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ImportRefused(f"In {where}, message {key}: \"children\" is not a list.")
    return [str(c) for c in value if str(c) in nodes]


# -- Open WebUI --------------------------------------------------------------------


def _open_webui(item: dict, n: int) -> ImportedConversation:
    chat = item["chat"]
    title = _title(chat.get("title")) or _title(item.get("title"))
    where = _where(n, title)
    history = chat.get("history")
    if not isinstance(history, dict) or not isinstance(history.get("messages"), dict):
        raise ImportRefused(f"In {where}, \"chat.history.messages\" is missing or not an "
                            f"object of messages by id.")
    nodes: dict[str, dict] = {}
    for key, message in history["messages"].items():
        if not isinstance(message, dict):
            raise ImportRefused(f"In {where}, message {key} is not an object.")
        nodes[str(key)] = message
    kept: dict[str, ImportedMessage | None] = {}
    for key, message in nodes.items():
        role, content = message.get("role"), message.get("content", "")
        if not isinstance(role, str):
            raise ImportRefused(f"In {where}, message {key}: the role is missing.")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ImportRefused(f"In {where}, message {key}: \"content\" is not text.")
        kept[key] = (ImportedMessage(key, None, role, content)
                     if role in KEPT_ROLES and content.strip() else None)
    parents = {key: _parent_key(m.get("parentId"), nodes) for key, m in nodes.items()}
    children = {key: _child_keys(m.get("childrenIds"), nodes, where, key)
                for key, m in nodes.items()}
    return _tree(title, kept, parents, children, history.get("currentId"), where)


# -- the tree ----------------------------------------------------------------------


def _tree(title: str, kept: dict[str, ImportedMessage | None], parents: dict[str, str | None],
          children: dict[str, list[str]], current: object, where: str) -> ImportedConversation:
    """The kept messages, parents before children, each hung from its nearest kept
    ancestor. A node's children are those that name it as their parent (the source's
    children lists only order them), so a file whose lists disagree still reads."""
    by_parent: dict[str | None, list[str]] = {}
    for key in kept:
        by_parent.setdefault(parents[key], []).append(key)
    for key, listed in children.items():
        mine = by_parent.get(key, [])
        order = {c: i for i, c in enumerate(listed)}
        mine.sort(key=lambda c: order.get(c, len(order)))
    out = ImportedConversation(title)
    anchor: dict[str, str | None] = {}  # node -> the nearest kept node at or above it
    stack = [(key, None) for key in reversed(by_parent.get(None, []))]
    seen: set[str] = set()
    while stack:
        key, above = stack.pop()
        if key in seen:
            continue  # a cycle in a damaged file: each node once
        seen.add(key)
        message = kept[key]
        if message is not None:
            message.parent = above
            out.messages.append(message)
        anchor[key] = key if message is not None else above
        stack.extend((c, anchor[key]) for c in reversed(by_parent.get(key, [])))
    if not out.messages:
        raise ImportRefused(f"{where[:1].upper()}{where[1:]} has no user or assistant "
                            f"message with text.")
    current_key = str(current) if current is not None else None
    out.current = anchor.get(current_key) if current_key in anchor else None
    if out.current is None:
        out.current = out.messages[-1].key
    return out

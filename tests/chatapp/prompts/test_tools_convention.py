"""The tool-call convention in prompts: rendering, parsing a reply's calls back, and how
much of a streaming reply may be sent before a call's opening tag."""

from chatapp.prompts import tools


def test_a_rendered_call_parses_back():
    text = "Let me check.\n" + tools.call_text("get_weather", {"city": "Paris"})
    content, calls = tools.parse_calls(text, ["get_weather"])
    assert content == "Let me check." and calls == [tools.ParsedCall("get_weather",
                                                                     {"city": "Paris"})]


def test_a_block_that_is_not_a_known_call_leaves_the_text():
    for bad in ['<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>',
                "<tool_call>\nnot json\n</tool_call>",
                '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>']:
        assert tools.parse_calls(bad, ["f"]) == (bad, [])


def test_the_same_tools_render_the_same_system_text():
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert tools.system_with_tools("Be brief.", [fn]) == tools.system_with_tools(
        "Be brief.", [dict(fn)])
    assert tools.system_with_tools(None, [fn]).startswith("# Tools")


def test_streaming_holds_back_from_a_possible_opening_tag():
    assert tools.held_back("Hello") == 5
    assert tools.held_back("Hello <tool") == len("Hello ")
    assert tools.held_back("Hi <tool_call>\n{") == len("Hi ")
    assert tools.held_back("a < b") == len("a < b")

"""The tool-call convention in prompts: rendering, parsing a reply's calls back, and how
much of a streaming reply may be sent before a call's opening tag."""

from chatapp.prompts import tools

HERMES = tools.HERMES


def test_a_rendered_call_parses_back():
    text = "Let me check.\n" + HERMES.call_text("get_weather", {"city": "Paris"})
    content, calls = HERMES.parse_calls(text, ["get_weather"])
    assert content == "Let me check." and calls == [tools.ParsedCall("get_weather",
                                                                     {"city": "Paris"})]


def test_a_block_that_is_not_a_known_call_leaves_the_text():
    for bad in ['<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>',
                "<tool_call>\nnot json\n</tool_call>",
                '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>']:
        assert HERMES.parse_calls(bad, ["f"]) == (bad, [])


def test_the_same_tools_render_the_same_system_text():
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert HERMES.system_with_tools("Be brief.", [fn]) == HERMES.system_with_tools(
        "Be brief.", [dict(fn)])
    assert HERMES.system_with_tools(None, [fn]).startswith("# Tools")


def test_streaming_holds_back_from_a_possible_opening_tag():
    assert HERMES.held_back("Hello") == 5
    assert HERMES.held_back("Hello <tool") == len("Hello ")
    assert HERMES.held_back("Hi <tool_call>\n{") == len("Hi ")
    assert HERMES.held_back("a < b") == len("a < b")


def test_each_shipped_format_names_its_convention():
    from chatapp.prompts.formats import get_format

    assert tools.convention_for(get_format("chatml")).name == "hermes"
    assert tools.convention_for(get_format("llama3")).name == "llama3"


def test_llama3_calls_are_the_whole_reply_in_json_with_parameters():
    llama = tools.CONVENTIONS["llama3"]
    text = llama.call_text("get_weather", {"city": "Paris"})
    assert text == '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert llama.parse_calls(text, ["get_weather"]) == (
        "", [tools.ParsedCall("get_weather", {"city": "Paris"})])
    assert llama.parse_calls("<|python_tag|>" + text, ["get_weather"])[1]
    assert llama.parse_calls("It is sunny.", ["get_weather"]) == ("It is sunny.", [])
    # A reply that starts as JSON is held back while it streams; prose is not.
    assert llama.held_back('{"name": "get_') == 0 and llama.held_back("Sunny") == 5
    assert llama.result_role == "ipython" and llama.opening == ""


def test_a_forced_call_s_schema_uses_the_convention_s_key():
    import json

    from chatapp.api.v1.tool_params import parse_tools

    fn = {"type": "object", "properties": {"city": {"type": "string"}}}
    request = parse_tools({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": fn}}], "tool_choice": "required"})
    for name, key in (("hermes", "arguments"), ("llama3", "parameters")):
        schema = json.loads(request.call_schema(tools.CONVENTIONS[name]))
        assert schema["properties"][key] == fn and schema["required"] == ["name", key]


def test_a_result_turn_in_its_own_role_builds():
    """Llama 3's results are `ipython` turns: the builder renders them like any turn."""
    from chatapp.prompts.services import PromptBuilder
    from tests.chatapp.prompts.conftest import tokenizer_with

    tok = tokenizer_with(special=("<|begin_of_text|>", "<|start_header_id|>",
                                  "<|end_header_id|>", "<|eot_id|>"))
    builder = PromptBuilder(tok, block_size=16)
    llama = tools.convention_for(builder.chat_format)
    assert llama.name == "llama3"
    call = llama.call_text("f", {"x": 1})
    turns = [("system", "Be brief."), ("user", "Call f.")]
    first = builder.build_from_turns(turns)
    turns += [("assistant", call), (llama.result_role, llama.response_text("42"))]
    second = builder.build_from_turns(turns)
    assert second.token_ids[: len(first.token_ids)] == first.token_ids
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>" in tok.decode(
        list(second.token_ids))

"""An OpenAI chat-completions body into a Gemini ``GenerateContentRequest``.

    chat completions                          Gemini
    ----------------------------------------  ------------------------------------------
    system messages (all, in order)           systemInstruction.parts[].text
    user / assistant                          contents[] role user / model
    assistant tool_calls                      functionCall parts {name, args}
    tool messages                             functionResponse parts {name, response},
                                              in the user turn after the call
    text / image_url parts                    text / inlineData (data: URL) /
                                              fileData (http(s) URL, fileUri)
    max_tokens temperature top_p stop seed    generationConfig maxOutputTokens temperature
                                              topP stopSequences seed
    response_format json_object / json_schema generationConfig responseMimeType
                                              application/json (+ responseSchema)
    tools (function)                          tools[0].functionDeclarations
    tool_choice auto/none/required/{name}     toolConfig.functionCallingConfig mode
                                              AUTO/NONE/ANY (+ allowedFunctionNames)

Gemini keeps no ids on function calls: the gateway names each call it returns
``call_`` + a hash of the request id and the call's position (:func:`tool_call_id`), and a
``tool`` message finds its function's name through the ``tool_calls`` of the assistant
messages before it in the same request (a caller always sends them back with the
results). Gemini's thinking models sign each function call (``thoughtSignature``) and
want the signature back with the call on the next turn: it rides in the id, after
``__thought__``, and is put back on the ``functionCall`` part. Consecutive turns of one
role are merged into one content (Gemini alternates user and model; parallel calls'
results go in one user turn, as Gemini asks).
``parallel_tool_calls`` and ``web_search_options`` have no Gemini form: they are named in
``svc.ignored_parameters``.
"""

from __future__ import annotations

import hashlib
import mimetypes
from typing import Any

import orjson

from gateway.providers.chat_shapes import call_arguments
from gateway.providers.gemini.gemini_schema import SchemaRefused, gemini_schema

#: forwarded chat parameters Gemini has no form for
IGNORED = ("parallel_tool_calls", "web_search_options")


class TranslationRefused(ValueError):
    """A chat body that cannot be written as a Gemini request; the message says why."""


#: between a tool call's id and the thought signature Gemini gave the call
SIGNATURE_MARK = "__thought__"


def tool_call_id(request_id: str, index: int, signature: str | None = None) -> str:
    """The id of the ``index``-th function call of an answer: the same on the streamed
    and the whole form of one call, different across calls; the call's thought signature
    (base64) after :data:`SIGNATURE_MARK` when Gemini gave one."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=12).hexdigest()
    return f"call_{digest}{SIGNATURE_MARK}{signature}" if signature else f"call_{digest}"


def generate_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Gemini request for the chat-completions ``body``."""
    system, contents = _contents(body.get("messages") or [])
    request: dict[str, Any] = {"contents": contents}
    if system:
        if contents:
            request["systemInstruction"] = {"parts": system}
        else:  # only system messages: Gemini needs a content, the instruction is it
            request["contents"] = [{"role": "user", "parts": system}]
    config = _generation_config(body)
    if config:
        request["generationConfig"] = config
    tools = body.get("tools") or []
    if tools:
        request["tools"] = [{"functionDeclarations": [_declaration(tool) for tool in tools]}]
        choice = _tool_config(body.get("tool_choice"))
        if choice is not None:
            request["toolConfig"] = choice
    return request


def _contents(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, from assistant turns
    for index, message in enumerate(messages):
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_parts(message.get("content"), index, text_only=True))
            continue
        if role == "assistant":
            parts = _parts(message.get("content"), index, text_only=True)
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                call_id = str(call.get("id"))
                names[call_id] = str(function.get("name"))
                part: dict[str, Any] = {"functionCall": _function_call(function, index)}
                signature = call_id.partition(SIGNATURE_MARK)[2]
                if signature:
                    part["thoughtSignature"] = signature
                parts.append(part)
            _append(contents, "model", parts)
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in names:
                raise TranslationRefused(
                    f"messages[{index}].tool_call_id {call_id!r} answers no tool call of an "
                    "earlier assistant message; send the assistant message with its "
                    "tool_calls before the tool results"
                )
            response = {"name": names[call_id], "response": _tool_result(message.get("content"))}
            _append(contents, "user", [{"functionResponse": response}])
        else:
            _append(contents, "user", _parts(message.get("content"), index, text_only=False))
    return system, contents


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def _parts(content: Any, index: int, *, text_only: bool) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text", "refusal"):
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str) and text:
                parts.append({"text": text})
        elif kind == "image_url" and not text_only:
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append(_image(url, index))
        else:
            raise TranslationRefused(
                f"messages[{index}] has a content part of type {kind!r}, which this "
                "message cannot carry to Gemini; send text (and images in user messages)"
            )
    return parts


def _image(url: Any, index: int) -> dict[str, Any]:
    if isinstance(url, str) and url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        mime, _, encoding = head.partition(";")
        if encoding == "base64" and mime and data:
            return {"inlineData": {"mimeType": mime, "data": data}}
    elif isinstance(url, str) and url.startswith(("https://", "http://")):
        file: dict[str, Any] = {"fileUri": url}
        guessed = mimetypes.guess_type(url.split("?", 1)[0])[0]
        if guessed:
            file["mimeType"] = guessed
        return {"fileData": file}
    raise TranslationRefused(
        f"messages[{index}] has an image Gemini cannot take; send a base64 data URL "
        "(data:image/png;base64,...) or an http(s) URL"
    )


def _function_call(function: dict[str, Any], index: int) -> dict[str, Any]:
    args = call_arguments(function)
    if args is None:
        raise TranslationRefused(
            f"messages[{index}].tool_calls: the arguments of {function.get('name')!r} must be "
            "a JSON object for Gemini"
        )
    return {"name": str(function.get("name")), "args": args}


def _tool_result(content: Any) -> dict[str, Any]:
    """A tool's result as Gemini's ``response`` object: a JSON object result as it is,
    anything else under ``content``."""
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if isinstance(content, str):
        try:
            value = orjson.loads(content)
        except orjson.JSONDecodeError:
            value = content
        if isinstance(value, dict):
            return value
    return {"content": content}


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if body.get("max_tokens") is not None:
        config["maxOutputTokens"] = body["max_tokens"]
    for name, gemini in (("temperature", "temperature"), ("top_p", "topP"), ("seed", "seed")):
        if body.get(name) is not None:
            config[gemini] = body[name]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    response_format = body.get("response_format") or {}
    if response_format.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict) and schema:
            config["responseSchema"] = _schema(schema, "response_format", ordered=True)
    return config


def _schema(schema: dict[str, Any], where: str, *, ordered: bool) -> dict[str, Any]:
    try:
        return gemini_schema(schema, ordered=ordered)
    except SchemaRefused as exc:
        raise TranslationRefused(f"{where}: {exc}") from None


def _declaration(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise TranslationRefused("tools: Gemini takes function tools only")
    declaration: dict[str, Any] = {"name": str(function.get("name"))}
    if isinstance(function.get("description"), str):
        declaration["description"] = function["description"]
    parameters = function.get("parameters")
    if isinstance(parameters, dict):
        converted = _schema(parameters, f"tools[{function.get('name')}].parameters", ordered=False)
        if converted.get("properties"):  # a function without parameters declares none
            declaration["parameters"] = converted
    return declaration


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if choice == "none":
        return {"functionCallingConfig": {"mode": "NONE"}}
    if choice == "required":
        return {"functionCallingConfig": {"mode": "ANY"}}
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    return {"functionCallingConfig": {"mode": "AUTO"}}

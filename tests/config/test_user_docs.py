"""The documentation a user reads (README.md, docs/CONFIG.md, docs/providers/, and the
pages the README links to) says what holds, in terms a user has: no reference to texts
outside the repository (a spec, an issue number, a design file), every link into the
repository resolves, and its claims about client SDKs hold for the installed SDK."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import pytest
import trio

from tests.conftest import Gateway
from tests.support.procs import REPO_ROOT

DOCS = REPO_ROOT / "docs"
USER_DOCS = [
    REPO_ROOT / "README.md",
    DOCS / "CONFIG.md",
    DOCS / "clients.md",
    DOCS / "deployment.md",
    DOCS / "operations.md",
    *sorted((DOCS / "providers").glob("*.md")),
]
#: texts a user does not have: the project's spec, its issue tracker, its design notes
FOREIGN = re.compile(r"\bspec\b|\bspec's|\bissue \d+|DESIGN\.md", re.I)
#: [text](target) links, and repository paths named in the text (docs/..., deploy/...)
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAMED_PATH = re.compile(r"(?<![\w/.])((?:docs|deploy|bench|tests|gateway)/[\w./-]*\w)")


def relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize("page", USER_DOCS, ids=relative)
def test_no_reference_to_texts_outside_the_repository(page: Path) -> None:
    found = [
        f"{relative(page)}:{n}: {line.strip()}"
        for n, line in enumerate(page.read_text().splitlines(), start=1)
        if FOREIGN.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", USER_DOCS, ids=relative)
def test_every_link_and_named_path_resolves(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the page
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    for named in NAMED_PATH.findall(text):
        if not (REPO_ROOT / named).exists() and not any(REPO_ROOT.glob(named)):
            broken.append(named)
    assert not broken, f"{relative(page)}: {broken}"


def test_the_user_docs_exist() -> None:
    assert all(page.exists() for page in USER_DOCS)
    assert (DOCS / "providers" / "openai.md") in USER_DOCS


async def test_the_anthropic_sdks_api_key_is_sent_as_bearer_and_served(gateway: Gateway) -> None:
    """docs/clients.md: the pinned SDK's ``api_key=`` (like ``auth_token=``) is sent as
    ``Authorization: Bearer``, which the gateway serves."""
    token = (await gateway.create_key())["token"]

    def call(**auth: str) -> str:
        with anthropic.Anthropic(base_url=gateway.url, max_retries=0, timeout=10, **auth) as sdk:
            assert sdk.auth_headers == {"Authorization": f"Bearer {token}"}
            message = sdk.messages.create(
                model="gpt-4o-mini",
                max_tokens=16,
                messages=[{"role": "user", "content": "Say hello."}],
            )
            return message.type

    assert await trio.to_thread.run_sync(lambda: call(api_key=token)) == "message"
    assert await trio.to_thread.run_sync(lambda: call(auth_token=token)) == "message"

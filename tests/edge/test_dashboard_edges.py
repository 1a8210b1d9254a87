"""The rough edges of the dashboard's first round, each fixed (issue 33, point 4), over real
HTTP against an in-process gateway: rotate asks first, the revoke count, the create form,
the sign-in focus, a viewer's caps page, and amounts with one number of decimals."""

from __future__ import annotations

import re

import pytest

from gateway.edge.dashboard.format import amount, usd
from tests.conftest import Gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, csrf_in, signed_in

pytestmark = pytest.mark.both_stores


async def test_rotate_asks_first_and_only_the_confirmed_form_rotates(gateway: Gateway) -> None:
    key = await gateway.create_key(name="rotating")
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, _):
        keys = (await client.get("/dashboard/keys")).text
        assert f'href="/dashboard/keys/{key["id"]}/rotate"' in keys
        assert f'action="/dashboard/keys/{key["id"]}/rotate"' not in keys  # no one-click form
        confirm = await client.get(f"/dashboard/keys/{key['id']}/rotate")
        assert confirm.status_code == 200 and "Rotate rotating?" in confirm.text
        assert f'action="/dashboard/keys/{key["id"]}/rotate"' in confirm.text
        assert gateway.runtime.keyring.get(key["id"]).rotated_to is None  # type: ignore[union-attr]  # the key exists
        rotated = await client.post(
            f"/dashboard/keys/{key['id']}/rotate", data={"csrf_token": csrf_in(confirm.text)}
        )
        assert rotated.status_code == 200 and "Key rotated" in rotated.text
    record = gateway.runtime.keyring.get(key["id"])
    assert record is not None and record.rotated_to is not None


async def test_the_revoke_confirmation_counts_only_live_sub_keys(gateway: Gateway) -> None:
    parent = await gateway.create_key(name="parent", keys_manage=True)
    async with gateway.client(parent["token"]) as api:
        children = [
            (await api.post("/v1/keys", json={"name": f"child-number-{i}"})).json()
            for i in range(3)
        ]
        gone = await api.delete(f"/v1/keys/{children[0]['id']}")
        assert gone.status_code == 200
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, _):
        page = (await client.get(f"/dashboard/keys/{parent['id']}/revoke")).text
    assert "its 2 sub-keys" in page and "child-number-0" not in page
    assert "child-number-1" in page and "child-number-2" in page


def _blank_hints(page: str) -> list[str]:
    return re.findall(r'id="caps-(\w+)-blank">Blank: ([^<]+)<', page)


async def test_the_create_form_reads_as_the_issue_asks(gateway: Gateway) -> None:
    key = await gateway.create_key(name="edited")
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, _):
        new = (await client.get("/dashboard/keys/new")).text
        edit = (await client.get(f"/dashboard/keys/{key['id']}/caps")).text
    options = re.findall(r'<option value="(?:sandbox|live)"[^>]*>([^<]+)</option>', new)
    assert options == ["sandbox: free, mock model", "live: billed"]  # short enough to show
    assert all(len(text) <= 25 for text in options)
    scopes = new[new.index("<legend>Scopes</legend>") :]
    scopes = scopes[: scopes.index("</fieldset>")]
    assert 'name="byok"' not in scopes and 'name="byok"' in new
    assert "<legend>Caps</legend>" in new  # the legend is one word, inside its border
    hints = _blank_hints(new)
    assert hints == _blank_hints(edit) and len(hints) == 6  # "blank" said alike on both
    assert dict(hints) == {
        "usd_day": "no cap",
        "usd_month": "no cap",
        "rpm": "the default, 60",
        "tpm": "no cap",
        "max_in_flight": "the default, 20",
        "max_output_tokens": "the default, 4,096",
    }
    assert 'placeholder="the default, 60"' in new  # defaults shown in the fields
    for default in ("Default: sandbox", "(default: development)", "(default: standard)"):
        assert default in new


async def test_a_blank_cap_means_the_default_on_the_edit_form_too(gateway: Gateway) -> None:
    key = await gateway.create_key(name="edited", caps={"rpm": 7, "usd_day": 3})
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, _):
        form = await client.get(f"/dashboard/keys/{key['id']}/caps")
        data = {f"caps.{c}": "" for c in ("usd_day", "usd_month", "rpm", "tpm")}
        data |= {
            "caps.max_in_flight": "3",
            "caps.max_output_tokens": "",
            "csrf_token": csrf_in(form.text),
        }
        saved = await client.post(f"/dashboard/keys/{key['id']}/caps", data=data)
        assert saved.status_code == 303
    record = gateway.runtime.keyring.get(key["id"])
    assert record is not None
    assert record.caps.public() == {
        "usd_day": None, "usd_month": None, "rpm": 60, "tpm": None, "max_in_flight": 3,
        "max_output_tokens": 4096,
    }  # fmt: skip


async def test_after_a_wrong_password_the_focus_is_on_the_password(gateway: Gateway) -> None:
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with gateway.client() as client:
        first = await client.get("/dashboard/login")
        assert re.search(r'id="email"[^>]*autofocus', first.text)
        assert not re.search(r'id="password"[^>]*autofocus', first.text)
    async with signed_in(gateway, "o@example.com", "not the password at all") as (_c, answer):
        assert answer.status_code == 401
        assert re.search(r'id="password"[^>]*autofocus', answer.text)
        assert not re.search(r'id="email"[^>]*autofocus', answer.text)
        assert 'value="o@example.com"' in answer.text  # the email stays filled in


async def test_a_viewers_caps_page_shows_values_not_inputs(gateway: Gateway) -> None:
    key = await gateway.create_key(name="capped", caps={"usd_day": 2.5, "rpm": 9})
    await admin_user(gateway, email="v@example.com", role="viewer", password=PASSWORD)
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "v@example.com") as (client, _):
        page = (await client.get(f"/dashboard/keys/{key['id']}/caps")).text
    assert "<input" not in page.split('<main id="main"')[1] and "Save caps" not in page
    assert "$2.5000" in page and "<dd>9</dd>" in page and "no cap" in page
    async with signed_in(gateway, "o@example.com") as (client, _):
        page = (await client.get(f"/dashboard/keys/{key['id']}/caps")).text
    assert 'name="caps.rpm"' in page and 'value="9"' in page


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "—"), (0, "$0.0000"), (12.5, "$12.5000"), (1234.5678, "$1,234.5678"),
     (0.000123, "$0.0001"), (0.0000228, "<$0.0001"), (-3.0, "-$3.0000"),
     (-0.000002, "-<$0.0001"), (25, "$25.0000")],
)  # fmt: skip
def test_every_amount_has_four_decimals(value: float | None, text: str) -> None:
    assert usd(value) == text


def test_the_exact_amount_is_on_hover() -> None:
    assert str(
        amount(0.0000228)
    ) == '<span class="amount" title="$0.0000228 exactly"><$0.0001</span>'.replace("<$", "&lt;$")
    assert str(amount(-1.5)) == '<span class="amount" title="-$1.5 exactly">-$1.5000</span>'

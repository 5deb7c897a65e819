"""Page tokens (app/serving/page_tokens.py): signed, single use, expiring, carried in a cookie."""


def test_a_page_token_is_signed_single_use_and_expires():
    from app.serving.page_tokens import PageTokens, cookie_header, token_in

    tokens = PageTokens(ttl_s=60)
    token = tokens.issue(now=1000)
    assert tokens.claim(token, now=1010) and not tokens.claim(token, now=1011)  # single use
    assert not tokens.claim(tokens.issue(now=1000), now=1100)  # expired
    at, nonce, signature = tokens.issue(now=1000).split(".")
    assert not tokens.claim(f"{at}.{nonce}x.{signature}", now=1001) and not tokens.claim("1000.a.b", now=1001)
    assert not PageTokens().claim(tokens.issue(now=1000), now=1001)  # another server's key
    assert not tokens.claim(None) and not tokens.claim("") and not tokens.claim("x" * 10_000)
    fresh = tokens.issue()
    assert token_in(cookie_header(fresh, secure=False).decode().split(";")[0]) == fresh
    assert b"Partitioned" in cookie_header(fresh, secure=True) and b"HttpOnly" in cookie_header(fresh, secure=False)

-- Webhook endpoints: a secret can be rotated with an overlap, and a plain-http receiver can
-- be spoken to in HTTP/2. (Ids come from a sequence here and are never reused already.)

-- The secret before the last `rotate-secret`: requests are signed with it too until
-- previous_secret_until, so a receiver can switch without losing an event.
ALTER TABLE plantstore_webhook_endpoints
    ADD COLUMN previous_secret TEXT,
    ADD COLUMN previous_secret_until TIMESTAMPTZ,
    -- HTTP/2 with prior knowledge on a plain-http URL (`webhooks add --http2`); https
    -- receivers choose HTTP/2 or HTTP/1.1 themselves, by ALPN.
    ADD COLUMN http2 BOOLEAN NOT NULL DEFAULT false;

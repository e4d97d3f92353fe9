-- What must be unique is what two destinations would contend for: a webhook endpoint's
-- URL, and a stream destination's server with its stream and subject prefix. The URL
-- alone was unique, which refused a second stream or prefix on one server.
ALTER TABLE plantstore_webhook_endpoints DROP CONSTRAINT IF EXISTS plantstore_webhook_endpoints_url_key;
CREATE UNIQUE INDEX IF NOT EXISTS plantstore_webhook_endpoints_destination
    ON plantstore_webhook_endpoints (url, COALESCE(stream, ''), COALESCE(subject_prefix, ''));

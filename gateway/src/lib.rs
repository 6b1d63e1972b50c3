//! The gateway: an HTTP reverse proxy that identifies the caller, maps the path to a route
//! class, asks the limiter, and either proxies the request with the rate-limit fields or
//! answers 429 itself.

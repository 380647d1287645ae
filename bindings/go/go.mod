module github.com/outbox-rs/outbox/bindings/go

go 1.19

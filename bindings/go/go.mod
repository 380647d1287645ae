module outbox.local/outbox

go 1.19

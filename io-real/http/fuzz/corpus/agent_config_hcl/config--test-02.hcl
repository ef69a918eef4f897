consul {
  address    = "127.0.0.1:8501"
  ssl        = true
  verify_ssl = false
  ca_file    = "/etc/consul.d/ca.pem"
  cert_file  = "/etc/consul.d/client.pem"
  key_file   = "/etc/consul.d/client-key.pem"
  auth       = "nomad:s3cret"
}
client {
  enabled = true
  servers = ["127.0.0.1:4647"]
}

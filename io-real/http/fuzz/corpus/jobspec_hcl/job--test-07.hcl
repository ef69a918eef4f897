job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      service {
        port = "http"
        connect {}
        check {
          type     = "http"
          interval = "500ms"
          timeout  = "1s"
        }
      }
    }
  }
}

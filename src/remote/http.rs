//! The server's HTTP API, reached through an SSH port forward (servers usually listen on
//! 127.0.0.1) or directly when a URL is configured.

use std::time::Duration;

use super::{Host, RemoteError};

/// A probe that takes longer counts as "not ready yet" and is asked again at the next sample.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// A server's HTTP endpoint.
pub struct Server {
    client: reqwest::Client,
    base: String,
}

/// What `/health` says. SGLang answers 503 while starting and 200 with an empty body when healthy;
/// before weights are loaded its port is not even open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    Starting(u16),
    Closed(String),
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub max_model_len: Option<u64>,
}

impl Host {
    /// The server on `port` of this host: forwarded from a local port over the SSH connection,
    /// or at `url` when one is given.
    pub async fn server(&self, port: u16, url: Option<&str>) -> Result<Server, RemoteError> {
        let base = match (url, self) {
            (Some(url), _) => url.trim_end_matches('/').to_string(),
            (None, Host::Local) => format!("http://127.0.0.1:{port}"),
            (None, Host::Ssh(h)) => format!("http://127.0.0.1:{}", h.forward(port).await?),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .expect("an HTTP client without TLS builds");
        Ok(Server { client, base })
    }
}

impl Server {
    /// One probe, bounded: verification polls systemd between probes at least once a second, and
    /// a probe that hangs (a forwarded connection the server never answers) must not hold that up.
    pub async fn health(&self) -> Health {
        match self
            .client
            .get(format!("{}/health", self.base))
            .timeout(HEALTH_TIMEOUT)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => Health::Ready,
            Ok(r) => Health::Starting(r.status().as_u16()),
            Err(e) => Health::Closed(e.without_url().to_string()),
        }
    }

    pub async fn models(&self) -> Result<Vec<Model>, String> {
        let body = self.get_text("/v1/models").await?;
        parse_models(&body)
    }

    /// One deterministic chat completion (temperature 0); the answer's text.
    pub async fn chat(&self, model: &str, prompt: &str, max_tokens: u32) -> Result<String, String> {
        let request = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        });
        let response = self
            .client
            .post(format!("{}/v1/chat/completions", self.base))
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        let body = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "chat completion answered {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        let json: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("chat completion is not JSON: {e}"))?;
        json["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "chat completion has no choices[0].message.content".to_string())
    }

    async fn get_text(&self, path: &str) -> Result<String, String> {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        let body = response.text().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{path} answered {status}"))
        }
    }
}

/// Parses SGLang's `/v1/models` answer.
pub fn parse_models(body: &str) -> Result<Vec<Model>, String> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("/v1/models is not JSON: {e}"))?;
    let data = json["data"]
        .as_array()
        .ok_or("/v1/models has no `data` list")?;
    Ok(data
        .iter()
        .filter_map(|m| {
            Some(Model {
                id: m["id"].as_str()?.to_string(),
                max_model_len: m["max_model_len"].as_u64(),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sglang_models() {
        let body = r#"{"object":"list","data":[{"id":"qwen3.5-122b","object":"model","created":1,"owned_by":"sglang","root":"qwen3.5-122b","parent":null,"max_model_len":262144}]}"#;
        assert_eq!(
            parse_models(body).unwrap(),
            [Model {
                id: "qwen3.5-122b".into(),
                max_model_len: Some(262144)
            }]
        );
        assert!(parse_models("{}").is_err());
    }
}

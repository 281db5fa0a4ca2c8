//! Setting the demo shop up for a run through the admin API: reading the
//! products and putting a product's stock where the run needs it.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::http::Conn;

pub(crate) async fn products(addr: SocketAddr) -> anyhow::Result<Vec<Value>> {
    let mut c = Conn::connect(std::net::Ipv4Addr::new(127, 0, 0, 1), addr, 4096).await?;
    let r = c.request("GET", "/api/products", &[], None).await?;
    anyhow::ensure!(r.status == 200, "GET /api/products answered {}", r.status);
    Ok(serde_json::from_slice(&r.body)?)
}

pub(super) async fn stock_of(addr: SocketAddr, id: &str) -> Option<i64> {
    products(addr)
        .await
        .ok()?
        .into_iter()
        .find(|p| p["id"] == id)
        .and_then(|p| p["stock"].as_i64())
}

pub(crate) async fn set_stock(
    addr: SocketAddr,
    product: &Value,
    stock: i64,
    admin: &str,
) -> anyhow::Result<()> {
    let body = json!({
        "name": product["name"], "queue": product["queue"],
        "priceCents": product["priceCents"], "stock": stock,
    })
    .to_string();
    let id = product["id"].as_str().unwrap_or_default();
    let mut c = Conn::connect(std::net::Ipv4Addr::new(127, 0, 0, 1), addr, 4096).await?;
    let auth = format!("Bearer {admin}");
    let r = c
        .request(
            "PUT",
            &format!("/api/admin/products/{id}"),
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            Some(body.as_bytes()),
        )
        .await?;
    anyhow::ensure!(
        r.status == 200,
        "restock answered {}: {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    Ok(())
}

//! The product catalogue: every product on sale, what a queue's entry
//! tokens can still buy, and the operators' restocks.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{DEFAULT_MAX_PER_ORDER, OrderStore, Product, ProductUpdate};

/// The columns [`product_of`] reads, for `concat!` into queries (sqlx takes
/// only static SQL).
macro_rules! product_columns {
    () => {
        "id, name, queue, price_cents, stock, max_per_order"
    };
}

impl OrderStore {
    /// Every product.
    pub async fn products(&self) -> Result<Vec<Product>, sqlx::Error> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(product_of).collect()
    }

    /// One product.
    pub async fn product(&self, id: &str) -> Result<Option<Product>, sqlx::Error> {
        let row = sqlx::query(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(product_of).transpose()
    }

    /// The stock on sale through `queue`'s entry tokens: the units its
    /// products have left, and the most one order may take of any of them
    /// still in stock (1 when none is).
    pub async fn queue_stock(&self, queue: &str) -> Result<(i64, i64), sqlx::Error> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(stock), 0) AS BIGINT) AS units,
                    CAST(COALESCE(MAX(CASE WHEN stock > 0 THEN max_per_order END), 1) AS BIGINT)
                      AS per
             FROM products WHERE queue = $1",
        )
        .bind(queue)
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("units")?, row.try_get("per")?))
    }

    /// Adds or updates a product (operators restock through the admin
    /// API) and returns it as stored.
    pub async fn upsert_product(&self, update: &ProductUpdate) -> Result<Product, sqlx::Error> {
        let row = sqlx::query(concat!(
            "INSERT INTO products (id, name, queue, price_cents, stock, max_per_order)
             VALUES ($1, $2, $3, $4, $5, COALESCE($6, $7))
             ON CONFLICT (id) DO UPDATE SET name = excluded.name, queue = excluded.queue,
               price_cents = excluded.price_cents, stock = excluded.stock,
               max_per_order = COALESCE($6, products.max_per_order)
             RETURNING ",
            product_columns!()
        ))
        .bind(&update.id)
        .bind(&update.name)
        .bind(&update.queue)
        .bind(update.price_cents)
        .bind(update.stock)
        .bind(update.max_per_order)
        .bind(DEFAULT_MAX_PER_ORDER)
        .fetch_one(&self.pool)
        .await?;
        product_of(&row)
    }
}

/// A product from a row of [`product_columns!`].
fn product_of(r: &AnyRow) -> Result<Product, sqlx::Error> {
    Ok(Product {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        queue: r.try_get("queue")?,
        price_cents: r.try_get("price_cents")?,
        stock: r.try_get("stock")?,
        max_per_order: r.try_get("max_per_order")?,
    })
}

-- jaxagent SQL environment: a small online shop (written for jaxagent; no external data).
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    joined DATE NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price REAL NOT NULL,
    stock INTEGER NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    order_date DATE NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('shipped', 'pending', 'cancelled'))
);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, product_id)
);

INSERT INTO customers VALUES
    (1, 'Alice Martin', 'Lyon', 'France', '2021-03-14'),
    (2, 'Bruno Costa', 'Porto', 'Portugal', '2021-07-02'),
    (3, 'Chen Wei', 'Toronto', 'Canada', '2022-01-20'),
    (4, 'Dana Kovacs', 'Budapest', 'Hungary', '2022-05-11'),
    (5, 'Eva Schmidt', 'Berlin', 'Germany', '2022-09-30'),
    (6, 'Farid Haddad', 'Lyon', 'France', '2023-02-08'),
    (7, 'Grace Okafor', 'Toronto', 'Canada', '2023-04-17'),
    (8, 'Hiro Tanaka', 'Osaka', 'Japan', '2023-08-25'),
    (9, 'Ines Duarte', 'Lisbon', 'Portugal', '2024-01-05'),
    (10, 'Jonas Berg', 'Berlin', 'Germany', '2024-03-19');

INSERT INTO products VALUES
    (1, 'Trail Backpack', 'outdoor', 89.90, 14),
    (2, 'Camping Stove', 'outdoor', 54.50, 0),
    (3, 'Headlamp', 'outdoor', 24.99, 40),
    (4, 'Wireless Mouse', 'electronics', 19.99, 120),
    (5, 'Mechanical Keyboard', 'electronics', 109.00, 35),
    (6, 'USB-C Hub', 'electronics', 39.50, 0),
    (7, 'Noise-Cancelling Headphones', 'electronics', 249.00, 8),
    (8, 'Espresso Grinder', 'kitchen', 129.00, 6),
    (9, 'Cast Iron Pan', 'kitchen', 45.00, 22),
    (10, 'Chef Knife', 'kitchen', 72.00, 15),
    (11, 'Yoga Mat', 'fitness', 29.90, 50),
    (12, 'Kettlebell 12kg', 'fitness', 49.00, 0),
    (13, 'Water Bottle', 'outdoor', 15.00, 60);

INSERT INTO orders VALUES
    (1, 1, '2024-01-10', 'shipped'),
    (2, 2, '2024-01-15', 'shipped'),
    (3, 1, '2024-02-03', 'shipped'),
    (4, 3, '2024-02-14', 'cancelled'),
    (5, 5, '2024-02-20', 'shipped'),
    (6, 4, '2024-03-01', 'pending'),
    (7, 7, '2024-03-05', 'shipped'),
    (8, 3, '2024-03-18', 'shipped'),
    (9, 8, '2024-04-02', 'shipped'),
    (10, 5, '2024-04-11', 'pending'),
    (11, 6, '2024-04-22', 'shipped'),
    (12, 2, '2024-05-01', 'cancelled'),
    (13, 9, '2024-05-09', 'shipped'),
    (14, 7, '2024-05-20', 'shipped'),
    (15, 1, '2024-06-02', 'pending');

INSERT INTO order_items VALUES
    (1, 1, 1, 89.90), (1, 3, 2, 24.99),
    (2, 4, 1, 19.99), (2, 5, 1, 109.00),
    (3, 9, 1, 45.00), (3, 10, 1, 72.00),
    (4, 7, 1, 249.00),
    (5, 5, 1, 105.00), (5, 6, 2, 39.50),
    (6, 11, 2, 29.90), (6, 12, 1, 49.00),
    (7, 8, 1, 129.00), (7, 9, 2, 45.00),
    (8, 3, 3, 24.99), (8, 1, 1, 89.90),
    (9, 7, 1, 249.00),
    (10, 2, 1, 54.50),
    (11, 4, 2, 19.99), (11, 11, 1, 29.90),
    (12, 10, 1, 72.00),
    (13, 5, 1, 109.00), (13, 4, 1, 19.99),
    (14, 3, 1, 24.99),
    (15, 8, 1, 129.00), (15, 9, 1, 45.00);
